"""A small export format that lives in the test suite alone (tests/test_extra_format.py): each
episode's rows as JSON lines. ``entry`` is its catalogue entry (light: no format code imported),
``writer`` the module the entry names (``eva.formats.catalog.Format``)."""
