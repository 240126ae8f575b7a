"""The URL's user-info becomes Basic auth for the requests qtune sends with
urllib (model listing, /tokenize), as aiohttp does for the load."""

from __future__ import annotations

import base64
import urllib.parse

from hypothesis import given
from hypothesis import strategies as st

from qtune.load.http import split_auth

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


@given(user=_text, password=_text, port=st.integers(1, 65535))
def test_user_info_moves_into_the_header_and_out_of_the_url(user, password, port):
    q = urllib.parse.quote
    url = f"http://{q(user, safe='')}:{q(password, safe='')}@h.example:{port}/v1/models"
    bare, headers = split_auth(url)
    assert bare == f"http://h.example:{port}/v1/models"
    sent = base64.b64decode(headers["Authorization"].removeprefix("Basic ")).decode()
    assert sent == f"{user}:{password}"


def test_no_user_info_no_header_and_ipv6_kept():
    assert split_auth("http://[::1]:8000/x") == ("http://[::1]:8000/x", {})
    bare, headers = split_auth("http://u:p@[::1]:8000/x")
    assert bare == "http://[::1]:8000/x" and "Authorization" in headers
