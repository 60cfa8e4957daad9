"""BASIS inside trainers: :mod:`.keys` (the prompt-content cache both share), :mod:`.verl`
and :mod:`.trl` (each imports its trainer lazily)."""
