"""One module per algorithm, each with `build(ctx, size, offset=0, length=None) -> Schedule`,
its options model and its transfer estimate; registered here through the same public call
a user's plugin uses (table.register, re-exported as registry.register)."""

from orchestrator.collectives.algorithms import (bml, double_tree, flextree, halving_doubling, hdrm, hierarchical, hips,
                                                 mesh, ps, ring, tree)
from orchestrator.collectives import forms
from orchestrator.collectives.membership import keep_ranks
from orchestrator.collectives.table import register

register("ring", ring.build, options=ring.Options, transfers=ring.transfers, closed_form=forms.ring)
register("mesh", mesh.build, transfers=mesh.transfers, closed_form=forms.mesh)
register("ps", ps.build, options=ps.Options, transfers=ps.transfers, closed_form=forms.ps)
register("halving-doubling", halving_doubling.build, transfers=halving_doubling.transfers,
         closed_form=forms.halving_doubling)
register("tree", tree.build, transfers=tree.transfers)
register("double-tree", double_tree.build, options=double_tree.Options, transfers=double_tree.transfers)
register("hierarchical", hierarchical.build, options=hierarchical.Options, transfers=hierarchical.transfers,
         closed_form=forms.two_level)
register("flextree", flextree.build, options=flextree.Options, transfers=flextree.transfers,
         closed_form=forms.two_level)
# hips on BCube goes on as BML after a failure (hips.py): both keep the topology's ranks
register("hips", hips.build, options=hips.Options, transfers=hips.transfers, closed_form=forms.hips,
         reform=keep_ranks)
register("bml", bml.build, options=bml.Options, transfers=bml.transfers, closed_form=forms.bml, reform=keep_ranks)
register("hdrm", hdrm.build, transfers=hdrm.transfers, closed_form=forms.hdrm)
