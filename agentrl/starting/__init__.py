"""Starting policies by behaviour cloning: TinyAgent's RL base and SFT cold start in the gym, and the
cold start of chat models on scripted experts' conversations."""
