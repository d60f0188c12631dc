"""Orders as workflows: the stock update and fulfilment steps, and the fulfilled job id."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0002_stock_report"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="fulfilled_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="order",
            name="fulfilled_job_id",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="order",
            name="stock_updated_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
