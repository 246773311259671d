"""Where the gateway keeps state between requests (the stored Responses)."""
