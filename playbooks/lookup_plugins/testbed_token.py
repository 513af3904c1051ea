"""Ansible lookup `testbed_token`: the Control token of a lab server, derived on the
controller from the lab's secret, never sent anywhere but the server's own private config.

    token: "{{ lookup('testbed_token', testbed_node, secret_file=testbed_secret_file) }}"

HMAC-SHA256(secret, node name), hex: what orchestrator/deploy/agents.py gives the
orchestrator (a test checks that both agree). For machines outside a lab, set `agent_token`
in the inventory instead.
"""

from __future__ import annotations

import hashlib
import hmac

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: testbed_token
short_description: a testbed lab server's Control token
description: HMAC-SHA256 of the lab's secret (a file) and the server's name, hex.
options:
  _terms: {description: server names, required: true}
  secret_file: {description: the lab's secret (mode 0600), type: path, required: true}
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        path = self.get_option("secret_file")
        try:
            with open(path, "rb") as handle:
                secret = handle.read().strip()
        except OSError as exc:
            raise AnsibleError(f"testbed_token: cannot read the lab's secret {path}: {exc.strerror}") from None
        return [hmac.new(secret, str(node).encode(), hashlib.sha256).hexdigest() for node in terms]
