"""The files the csd command reads and writes, with one-line errors (torch-free, standard library only):

* :mod:`.outputs` – every file of a run written under a temporary name and put in place together, only once the whole
  output is complete (:class:`~.outputs.Output`; one file: :func:`~.outputs.write_atomic`); a failure leaves the
  folder as it was and says so in one line (:class:`~.outputs.OutputError`).
* :mod:`.inputs` – the checks of the files a command reads (weights folder, safetensors, config.json, prompts file):
  :class:`~.inputs.InputError`, one line naming the flag, the path and what is wrong.
* :mod:`.signals` – SIGINT / SIGTERM as an exception (:class:`~.signals.Interrupted`), so that a stopped run cleans up
  and says what it kept.
"""
