"""The recorders' observers, one concern per module (``runners.chain``: the step chain they observe for).

PyTorch (``torch_*``), registered for ``runners.torch.TorchRecorder``, in the order the
recorder runs them at each hook (their ranks): ``torch_gradients`` (gradients, the norm
before clipping), ``torch_manual`` (updates by hand, without ``torch.optim``),
``torch_loss`` (losses, the GradScaler), ``torch_memory`` (CUDA memory figures),
``torch_batches`` (DataLoader attribution, data order for state capture), ``torch_doctor``
(the doctor's extras: layer modes, the loss expression, ``bisect doctor``'s switches),
``torch_lossgraph`` (what enters a loss on logits: range, row sums, producing op),
``torch_lossshapes`` (element-wise loss arguments whose shapes broadcast to more elements),
``torch_evaluation`` (evaluation summaries), ``torch_init`` (parameters before the first
update), ``torch_forward`` (inputs, activations, outputs), ``torch_params`` (parameters and
optimizer state after the update), ``torch_capture`` (state capture, seeds, schedulers).
``torch_common`` holds their shared tensor helpers. ``rng_sources`` (framework-free, run by
the torch recorder) lists the generators the user's code builds without a seed. Collectives are
``runners.distributed_torch``'s.

TensorFlow (``tf_*``) for ``runners.tensorflow.TFRecorder``: ``tf_batches`` (batch IDs by
row content), ``tf_evaluation`` (evaluation summaries), ``tf_layers`` (inputs,
activations, outputs), ``tf_optimizer`` (the optimizer step: init, gradients, variables,
optimizer state; steps ended by hand), ``tf_keras`` (the Keras wraps, ``fit``, XLA steps).
``tf_common`` holds their shared helpers.

Nothing here is imported until its framework's recorder is.
"""
