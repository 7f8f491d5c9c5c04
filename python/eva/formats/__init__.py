"""Export formats: one module or package per format, found by name through ``eva.export.registry``.

``lerobot_v21`` (native), ``lerobot_v3``, ``hdf5`` and ``mcap`` each satisfy
``eva.formats.base.FormatModule``: ``OPTIONS`` (their dataclass in ``eva.formats.options``),
``write_subset(reader, meta, staging_dir, progress, options)`` and ``verify(export_dir)``
(docs/design.md, "Export interfaces"). Formats read the v2.1 source directly through
``eva.dataset.reader.DatasetReader`` and never import each other or ``eva.export``; what they share
lives in ``base``, ``options``, ``_decode`` (PyAV) and ``_verify`` (the verifiers' collector and
checks). This package deliberately imports none of the formats, so a missing or broken format
cannot break the others.
"""
