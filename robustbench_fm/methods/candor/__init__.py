"""CANDOR (candor.md v4, candor_v1.md): chance-calibrated neighbourhood discordance."""
