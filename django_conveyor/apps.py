from django.apps import AppConfig
from django.core import checks


class ConveyorConfig(AppConfig):
    name = "django_conveyor"
    label = "conveyor"
    verbose_name = "Conveyor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks as conveyor_checks
        from .api.checks import check_api_settings

        checks.register(conveyor_checks.check_settings)
        checks.register(conveyor_checks.check_database)
        checks.register(check_api_settings)
