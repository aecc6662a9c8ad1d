"""The checked-in OpenAPI document is the one the app serves, and it is a valid OpenAPI document."""

from __future__ import annotations

import json
from pathlib import Path

from openapi_spec_validator import validate

from producer.api.app import openapi_document

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_checked_in_document_matches_the_app() -> None:
    assert json.loads(DOCUMENT.read_text()) == openapi_document(), (
        "docs/openapi.json is stale: regenerate it with `wesichain api --openapi > docs/openapi.json`"
    )


def test_document_is_valid_openapi() -> None:
    validate(json.loads(DOCUMENT.read_text()))


def test_every_operation_documents_the_error_shape() -> None:
    document = openapi_document()
    for path, operations in document["paths"].items():
        if path in ("/healthz", "/readyz"):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            assert responses["4XX"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }, (method, path)
            assert "422" not in responses, (method, path)
