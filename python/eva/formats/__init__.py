"""Export formats: one module or package per format, each named by an entry of
``eva.formats.catalog``.

``lerobot_v21`` (native), ``lerobot_v3``, ``hdf5`` and ``mcap`` each satisfy
``eva.formats.catalog.Format``: ``write_subset(reader, meta, staging_dir, progress, options)``,
``verify(export_dir)`` and ``TASKS`` (how a subset is cut into tasks: ``eva.formats.tasks``);
their options are dataclasses in ``eva.formats.options`` (``eva.formats.base``: how an option is
declared). Formats read the v2.1 source directly through ``eva.dataset.reader.DatasetReader``
and never import each other or ``eva.export``; what they share lives in ``base``, ``tasks``,
``options``, ``_decode`` (PyAV) and ``_verify`` (the verifiers' collector and checks). This
package deliberately imports none of the formats, so a missing or broken format cannot break
the others.
"""
