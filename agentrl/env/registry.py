"""The registry of environments (agentrl.core.registry): name -> EnvironmentSpec (agentrl.env.base). The ones that
ship with the project are declared by module in `BUILTIN` and imported on first use; a stage names those it uses
in its `USES`."""
from __future__ import annotations

from agentrl.core.registry import Registry

BUILTIN = {
    "gym": "agentrl.env.gym.spec",          # the coding gym: read, test, edit <op>, submit (TinyAgent's)
    "coding": "agentrl.env.coding.spec",    # generic coding tools: Read, Edit, Write, Bash, graded in the sandbox
}
ENVIRONMENTS = Registry("environment", "environment", builtin=BUILTIN)


def environment(name: str):
    """The EnvironmentSpec registered as `name` (a one-line ConfigError naming the allowed ones otherwise)."""
    return ENVIRONMENTS.get(name)
