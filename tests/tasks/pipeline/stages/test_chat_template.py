"""model.chat_template: a Jinja string is used as it is, a file is read, anything else is
refused with a sentence naming the setting (before any template is applied)."""

import pytest

from data_checks.loading import DataError
from tasks.pipeline.stages.validate import chat_template

TEMPLATE = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"


def test_a_template_string_or_a_file_holding_one(tmp_path):
    assert chat_template(None) is None
    assert chat_template(TEMPLATE) == TEMPLATE
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    assert chat_template(str(path)) == TEMPLATE


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"model.chat_template='.*nope.jinja': no such file, "
                                        "and not a Jinja template"):
        chat_template(str(tmp_path / "nope.jinja"))
