"""Search quality: the strategies against the baselines, the training protocol, what ROCS masking costs."""
