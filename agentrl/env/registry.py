"""The environments (agentrl.core.variants.ENVIRONMENTS: name -> EnvironmentSpec, agentrl.env.base). The ones that
ship with the project are declared here by module and imported on first lookup; a stage imports the spec it uses
(`GYM`, `CODING`), so its code closure holds that module."""
from __future__ import annotations

from agentrl.core.variants import ENVIRONMENTS

ENVIRONMENTS.declare({
    "gym": "agentrl.env.gym.spec",          # the coding gym: read, test, edit <op>, submit (TinyAgent's)
    "coding": "agentrl.env.coding.spec",    # generic coding tools: Read, Edit, Write, Bash, graded in the sandbox
})


def environment(name: str):
    """The EnvironmentSpec registered as `name` (a one-line ConfigError naming the allowed ones otherwise)."""
    return ENVIRONMENTS.get(name)
