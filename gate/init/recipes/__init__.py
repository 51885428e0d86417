"""Update recipes: each stack's weight push as a gate hook, copied into the user's repository by
``gate init``. A recipe imports only what the engine's environment has (vllm, torch)."""
