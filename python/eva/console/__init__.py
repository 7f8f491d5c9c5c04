"""The operator console: a local web server (``eva console``) over the recorder, review, export
and upload; ``session.py`` holds the behaviour, ``server.py`` the HTTP side, ``static/`` the page.
"""
