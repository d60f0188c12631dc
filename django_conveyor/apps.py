from django.apps import AppConfig, apps
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
        checks.register(conveyor_checks.check_cron)
        checks.register(conveyor_checks.check_queues)
        checks.register(conveyor_checks.check_backend)
        if apps.is_installed("django.contrib.admin"):
            from .admin import schedules  # noqa: F401  (registers the schedules' admin)
        checks.register(check_api_settings)
