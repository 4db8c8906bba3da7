"""Sweeps beyond one machine: a matrix stage's instances as Ray tasks, recorded by DVC as if `dvc repro` ran them
(docs/sweep.md). `plan` asks DVC what to run, `worker` runs one instance on any node, `driver` schedules them and
records each finished one. Ray is imported by `driver` only."""
