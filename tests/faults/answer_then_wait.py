"""Run by test_chaos: the app on SLUICE_DATA_DIR loads MODEL_DIR, asks a question, prints STREAMING once
the answer's first chunk is saved, then keeps generating until it is killed."""
import sys

from PySide6.QtCore import QTimer

from app.gui import create_application, open_main_window
from app.store import ChatSettings

app = create_application()
window = open_main_window(autoload=False)
window.controller.new_conversation()
window.controller.set_chat_settings(ChatSettings(temperature=0.0, max_new_tokens=4000))


def on_loaded(_info):
    window.controller.send("Tell me a very long story.")


def on_streamed(_message_id, content):
    if content:
        window.store.wait_saved()               # the saver thread writes in batches: wait for this one
        print("STREAMING", flush=True)


window.model_loaded.connect(on_loaded)
window.controller.message_streamed.connect(on_streamed)
QTimer.singleShot(0, lambda: window.load_model(sys.argv[1]))
app.exec()
