"""The chat page at `/`: a small static bundle shipped in the package (webui/), no network at run time.

The page is public (it holds no data: conversations live in the browser's localStorage); the API it
calls keeps its bearer auth, and the page asks the user for the key when the server wants one. The
files are read once, when the app is built. A strict Content-Security-Policy allows only this
origin's scripts, styles and connections: no inline script, no third-party resource, no framing; images
are this origin's or blob: URLs the page made itself (the images attached to a message, shown as thumbnails:
they are sent to the API as data: URLs, but the CSP allows no data: image).
"""
from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# blob: images are the page's own (URL.createObjectURL of the images attached and kept in a conversation)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
# path -> (file in webui/, media type); nothing else under /webui/ is served
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/webui/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
PATHS = tuple(ASSETS)   # public even with --api-key


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("webui", name).read_bytes()


def routes() -> list[Route]:
    """GET routes serving the bundle, each with the security headers."""
    out = []
    for path, (name, media_type) in ASSETS.items():
        body = _read(name)

        async def asset(request: Request, body=body, media_type=media_type) -> Response:
            return Response(body, media_type=media_type, headers=HEADERS)

        out.append(Route(path, asset, methods=["GET", "HEAD"]))
    return out
