"""Speed and memory: rankitect against plain PyTorch twins, the data path, compile, ROCS serving, search overhead."""
