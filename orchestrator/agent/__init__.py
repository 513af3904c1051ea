"""The agent: runs inside every server (`testbed-agent`), serves Control on the management
network and Data on the fabric, and executes its rank's part of each collective."""
