"""One module per algorithm, each with `build(ctx, size, offset=0, length=None) -> Schedule`,
its options model and its transfer estimate; registered here through the same public call
a user's plugin uses (table.register, re-exported as registry.register)."""

from orchestrator.collectives.algorithms import (bml, double_tree, flextree, halving_doubling, hdrm, hierarchical, hips,
                                                 mesh, ps, ring, tree)
from orchestrator.collectives.table import register

register("ring", ring.build, options=ring.Options, transfers=ring.transfers)
register("mesh", mesh.build, transfers=mesh.transfers)
register("ps", ps.build, options=ps.Options, transfers=ps.transfers)
register("halving-doubling", halving_doubling.build, transfers=halving_doubling.transfers)
register("tree", tree.build, transfers=tree.transfers)
register("double-tree", double_tree.build, options=double_tree.Options, transfers=double_tree.transfers)
register("hierarchical", hierarchical.build, options=hierarchical.Options, transfers=hierarchical.transfers)
register("flextree", flextree.build, options=flextree.Options, transfers=flextree.transfers)
register("hips", hips.build, options=hips.Options, transfers=hips.transfers)
register("bml", bml.build, options=bml.Options, transfers=bml.transfers)
register("hdrm", hdrm.build, transfers=hdrm.transfers)
