"""The model runner: one process's weights, device KV pool and forward pass, and its start-up choices (autotune, decisions, levers), tensor parallel ranks included."""
