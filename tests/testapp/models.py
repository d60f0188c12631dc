from django.db import models


class Effect(models.Model):
    """A business write made by a test handler: counted to prove exactly-once."""

    job_id = models.BigIntegerField()
    token = models.BigIntegerField()
    worker = models.CharField(max_length=64)
    label = models.CharField(max_length=64, default="")

    class Meta:
        app_label = "testapp"

    def __str__(self) -> str:
        return f"{self.label} of job {self.job_id} (token {self.token})"
