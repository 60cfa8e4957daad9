"""BASIS inside trainers: :mod:`.keys` (the prompt-content cache they share), :mod:`.verl`
with :mod:`.verl_plugin` (the module verl loads), :mod:`.openrlhf` and :mod:`.trl` (each
imports its trainer lazily)."""
