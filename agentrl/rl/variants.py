"""Every variant a params knob can name, registered: importing this module fills the registries of
agentrl.core.variants -- the objective's variants with their re-derivations (objectives), the keep modes (rollout),
the learning-rate schedules (schedule), the curricula (curriculum) and the shipped environments (declared by module
in agentrl.env.registry). A process that validates the rl section (or an ablation arm's rl overrides, or a lab's
environment) without running the loop imports it; the trainer's modules register their own on import."""
from agentrl.env import registry as environments
from agentrl.rl import curriculum, objectives, rollout, schedule

REGISTERING = (objectives, rollout, schedule, curriculum, environments)
