"""Every request the product sends, held to what real API servers of 1.34-1.37 accept and to the chart's RBAC."""
