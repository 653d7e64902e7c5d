"""The chat settings' "Structured output": the field in the dialog, and an answer that follows the schema
from the real engine thread and the random-weight demo model (only the grammar can make it JSON)."""
import json

from PySide6.QtCore import Qt

from app.store import ChatSettings
from app.views.chat_settings_dialog import ChatSettingsDialog

from app_helpers import WAIT_MS

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


def test_the_dialog_shows_and_keeps_the_structured_output(qtbot):
    dialog = ChatSettingsDialog(ChatSettings(structured_output="json"))
    qtbot.addWidget(dialog)
    assert dialog.structured_output.text() == "json"
    dialog.structured_output.setText(json.dumps(SCHEMA))
    assert dialog.value().structured_output == json.dumps(SCHEMA)


def test_a_setting_that_cannot_be_used_is_refused_in_the_dialog_under_its_field(qtbot):
    dialog = ChatSettingsDialog(ChatSettings())
    qtbot.addWidget(dialog)
    dialog.show()
    for typed, words in (('{"type": "object", ', "neither 'json' nor a JSON Schema"),
                         ('{"type": "nonsense"}', "cannot be used: Invalid type: nonsense")):
        dialog.structured_output.setText(typed)
        dialog.accept()
        assert dialog.isVisible() and dialog.result() != dialog.DialogCode.Accepted     # kept open, nothing saved
        assert dialog.structured_error.isVisible() and words in dialog.structured_error.text()
        assert "\n" not in dialog.structured_error.text()
    qtbot.keyClicks(dialog.structured_output, "x")                   # editing hides the old error
    assert not dialog.structured_error.isVisible()
    dialog.structured_output.setText(json.dumps(SCHEMA))
    dialog.accept()
    assert dialog.result() == dialog.DialogCode.Accepted and not dialog.structured_error.isVisible()


def test_a_chat_with_a_schema_answers_in_it(qtbot, loaded_window):
    window = loaded_window
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=30, temperature=0.9, seed=2,
                                                     structured_output=json.dumps(SCHEMA)))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.composer.edit.setFocus()
        qtbot.keyClicks(window.composer.edit, "Is it?")
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    assert isinstance(json.loads(finished.args[0].content)["ok"], bool)
