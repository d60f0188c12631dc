import os

from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        if os.environ.get("CONVEYOR_TEST_UNCHECKED"):
            from tests import unchecked

            unchecked.install()
