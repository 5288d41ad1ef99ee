"""Operations: deploy, health, upgrades, drills, the command line (plain Python)."""
