"""The user's JSON Schema before the grammar engine (llguidance) compiles it: the integers
and numbers it would get wrong, and the rewrites applied first."""
