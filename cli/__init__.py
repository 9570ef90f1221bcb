"""houchu's command line: ``houchu serve``, ``houchu fetch``, ``houchu bench`` (``cli.main``)."""
