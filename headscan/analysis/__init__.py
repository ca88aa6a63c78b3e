"""Reading tables: ranking heads, findings in sentences, runs side by side, positions, movement and syntax."""
