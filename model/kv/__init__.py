"""The device KV pools (standard and MLA), what every paged pool shares, and page copies to and from the host tier."""
