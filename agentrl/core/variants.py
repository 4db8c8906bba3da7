"""The registries a params knob chooses from, declared in the bottom layer and filled from above: the packages that
implement the entries register them when they are imported -- rl/ the objective's and the loop's variants beside
their formulas, env/ the environments (by module, imported on first use) -- and the knob takes the registry as its
allowed values (agentrl.core.config, agentrl.core.lab_config), so a variant's name lives only in its registration.

A knob of one of these is checked once the process has imported what registers its entries: a stage script
imports them (agentrl.rl.variants has every one), and the early check of a stage process, which runs before that,
leaves these fields to `run_stage` (agentrl.core.knobs.registries_deferred). An empty registry is one line saying
so, never an empty list of allowed values.
"""
from agentrl.core.registry import Registry

# one function per name, one signature per kind (agentrl.rl.objectives' docstring); each registered with its
# independent re-derivation (meta `reference`, agentrl.rl.references) beside its formula
ADV_ESTIMATORS = Registry("advantage estimator", "rl.adv_estimator")     # reward -> baseline
REWARD_SCALES = Registry("reward scale", "rl.scale_rewards")             # advantage divisor
RATIO_LEVELS = Registry("policy ratio", "rl.ratio_level")                # importance ratio
POLICY_LOSSES = Registry("policy loss", "rl.policy_loss")                # per-token policy term
LOSS_MODES = Registry("loss aggregation", "rl.loss_mode")                # per-token loss -> scalar
KL_KINDS = Registry("KL estimator", "rl.kl_kind")                        # per-token KL penalty
OBJECTIVE = (ADV_ESTIMATORS, REWARD_SCALES, RATIO_LEVELS, POLICY_LOSSES, LOSS_MODES, KL_KINDS)

# the loop's variants
KEEP_MODES = Registry("keep mode", "rl.keep")                            # which groups are trained on
LR_SCHEDULES = Registry("learning-rate schedule", "rl.lr_schedule")
CURRICULA = Registry("curriculum", "rl.curriculum")
TASK_DRAWS = Registry("task draw", "rl.task_draw")                       # which distinct tasks a step samples

# name -> EnvironmentSpec (agentrl.env.base); agentrl.env.registry declares the ones that ship
ENVIRONMENTS = Registry("environment", "environment")
