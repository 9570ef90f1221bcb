"""The device check's parts (``devtools/gpu_check.py``): install, steps, goals, the stand-in model, and the wheel folder for an offline GPU machine."""
