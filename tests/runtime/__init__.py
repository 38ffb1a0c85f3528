"""The run-time hostile corpus: what happens to runs, checkpoints, grids, data, prompts and plug-ins.

The spec corpus (``tests/hostile/``) feeds the tool broken *specs*. This one breaks what a run
meets while it runs or is resumed: damaged checkpoints, a resume that would change the run, folders
holding someone else's files, a full or read-only disk, hostile images, ablation grid files,
generation prompts, plug-ins, torchrun, logs and a second writer. ``tests/test_runtime_corpus.py``
runs every case (``cases.py``) through the command line and judges it (``harness.judge``):

* **status**: the exit status is one the case expects. 0 success; 2 a bad input (spec, argument,
  data, checkpoint, grid, a resume that would change the run); 1 an output that cannot be written
  (ENOSPC, EROFS, EACCES); 3 the folder is being written by another process;
* **message**: the output matches the case's regex, kept to the essential words (the path, file:line,
  key or field named, both values), and a failure prints an ``error: ...`` line on stderr;
* **no traceback** (``Traceback (most recent call last)`` never appears; under torchrun, in no
  worker's output), and a failure prints at most 40 lines;
* **time and memory**: the wall time is under the case's limit; in-process cases run under the
  hang and address-space guard of tests/guards.py; the cases that may hang or allocate a lot (a
  decompression bomb, a FIFO, an in-memory data set of terabytes, a real command line of bytes,
  torchrun, logs) run as their own process through ``measure.py`` (RLIMIT_AS, a timeout, the peak
  RSS of the process and every process it waited for);
* **nothing good was lost**: the sha256 of every file under the case's folder before the command
  equals the one after, except what the case says may change (``may_change``), and never what it
  says to keep (``keep``: the earlier checkpoints of a resumed run); no temporary ``.NAME.*.partial``
  is left behind.

A session fixture trains one tiny run once (specs/crate-digits.yaml at d 16, one layer, 4 steps,
batch 16, checkpoints at steps 2 and 4, about a second) and, when a case needs it, one tiny
ablation (ista against ista_soft, 3 steps) and one tiny masked language model (crate-bert-mini at
context 16 on a generated text folder, a WordPiece vocabulary of at most 64 tokens); each case copies what it needs into its own folder,
damages it, runs the command and is judged. The full and read-only disks are a real 256 kB (or
1 MB) tmpfs where this machine allows mounting, and otherwise failures injected where the system
would report them: the assertions run either way.

Cases by category: ``checkpoint`` (every kind of damage of the latest checkpoint: state.json, the
weights, AdamW's tensors, the RNG state, its spec, its step against its folder and the metrics),
``resume`` (another spec, data or setting; more, the same or fewer steps; --resume-from; no
checkpoint; run.json missing or tampered), ``folder``, ``fault``, ``data``, ``grid``, ``generate``,
``plugin``, ``torchrun``, ``log`` and ``lock``; and the input files and names of the newer commands, each
read by ``crate_compose.files.read_input``/``read_json``: ``setname`` (numbers in data set names and
``--set`` indexes that ``int()`` refuses or would misread), ``fetch`` (``--tarball`` not a regular file,
missing, unreadable, huge, not the pinned package), ``cache`` (a damaged data cache), ``tokenizer`` (a run's
damaged or replaced ``tokenizer.json``), ``infill`` (the text ``fill`` reads), ``hub`` (a hub's
``config.json`` beside imported weights) and ``textdir`` (text folders: a megabyte-long word, binary files,
a FIFO).

Run::

    .venv/bin/python -m pytest -q tests/test_runtime_corpus.py          # everything
    .venv/bin/python -m pytest -q tests/test_runtime_corpus.py -k r042  # one case
    .venv/bin/python -m pytest -q tests/test_runtime_corpus.py -k checkpoint   # a category
    RUNTIME_CORPUS_LOG=corpus.jsonl ...   # also one JSON line per case: status, time, peak RSS, first lines
    RUNTIME_CORPUS_INJECT=1 ... -k fault  # the disk failures injected even where mounting is permitted

Two cases are regression tests of their own, named for what they guard:
``test_hybrid_resume_is_refused`` (r051: a killed run of crate-digits resumed with ``--set
encoder.layer.sparsify.primitive=ista_soft``, whose shapes match, used to continue silently as a
hybrid) and ``test_stale_ablation_is_refused`` (r140: ``ablate --steps 3`` then ``ablate --steps 2``
into the same ``--out`` used to show the old runs as the new grid's).
"""
