"""The lever sweep (``houchu levers``): each lever on and off at several loads, answered as the four questions."""
