"""Frameworks users train with, run on the lab's servers beside the project's agents (table.py
says how one is registered; torch_gloo.py is PyTorch's gloo, the built-in)."""

from orchestrator.frameworks.table import (FRAMEWORKS, Framework, FrameworkResult, Job, get,  # noqa: F401
                                           register_framework, unregister_framework)
from orchestrator.frameworks import torch_gloo as _builtin  # noqa: F401,E402  registers "torch"
