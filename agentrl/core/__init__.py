"""The foundation: declaring and checking knobs and params, the CPU numerics pin, seeding, artifact
paths and atomic writes, the error boundary, and the registry of named variants."""
