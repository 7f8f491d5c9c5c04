"""Export formats: one module per format, found by name through ``eva.export.registry``.

``lerobot_v21`` (native), ``lerobot_v3``, ``hdf5`` and ``mcap`` each provide
``write_subset(reader, meta, staging_dir, progress, options)`` and ``verify(export_dir)``
(docs/design.md, "Export interfaces"). Formats read the v2.1 source directly through
``eva.dataset.reader.DatasetReader`` and never import each other or ``eva.export``. This package
deliberately imports none of them, so a missing or broken format cannot break the others.
"""
