"""The Hugging Face architecture sweep: every architecture transformers maps for causal LM (and,
as second tables, masked LM, seq2seq and image classification) built tiny from its config and
run on neuron against CPU. ``python -m torch_neuronx.hf_sweep --help``."""
