"""Call records: each conversation written to disk as it goes (audio, text, a summary), kept within a
retention and a quota, and read back over HTTP."""

from ._recorder import CallEnding as CallEnding
from ._recorder import Recorder as Recorder
from ._routes import add_record_routes as add_record_routes
from ._store import RecordFolderError as RecordFolderError
from ._store import RecordStore as RecordStore
from ._store import prepare_record_folder as prepare_record_folder
