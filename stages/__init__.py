"""One small script per DVC stage: read its params sections, call agentrl, write its outputs."""
