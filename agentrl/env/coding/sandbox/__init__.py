"""The sandbox: every execution of model-written code (test runs, `python FILE.py`, the hidden-test grader) runs
here, never in the trainer's process. docs/sandbox.md gives the mechanism, the limits and the hostile-program
suite."""
