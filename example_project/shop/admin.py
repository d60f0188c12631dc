from django.contrib import admin

from .models import GatewayCharge, Order, Payment, StockReport


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "email", "item", "quantity", "total", "created_at", "receipt_sent_at")
    search_fields = ("email", "item")

    @admin.display(description="total")
    def total(self, obj: Order) -> str:
        return obj.total_display


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ("id", "order", "amount_cents", "gateway_charge_id", "job_id", "token")
    readonly_fields = [f.name for f in Payment._meta.fields]


@admin.register(GatewayCharge)
class GatewayChargeAdmin(admin.ModelAdmin):
    list_display = ("charge_id", "reference", "amount_cents", "idempotency_key", "calls")
    readonly_fields = [f.name for f in GatewayCharge._meta.fields]


@admin.register(StockReport)
class StockReportAdmin(admin.ModelAdmin):
    list_display = ("day", "units", "revenue_cents", "job_id", "created_at")
    readonly_fields = [f.name for f in StockReport._meta.fields]
