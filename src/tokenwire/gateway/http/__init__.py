"""The served HTTP surface: the app and its routes, request reading, security, admission,
streaming responses and graceful shutdown. Everything here may import the layers below
(``apis``, ``upstreams``, ``routing``, ``supervision``, ``state``, ``observability``);
nothing below imports it."""
