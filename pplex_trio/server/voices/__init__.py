"""Voices from audio: the store of voices made from uploaded clips, and the routes that make and serve them."""

from ._routes import VoiceUpload as VoiceUpload
from ._routes import add_voice_routes as add_voice_routes
from ._store import VoiceStore as VoiceStore
from ._store import default_folder as default_folder
