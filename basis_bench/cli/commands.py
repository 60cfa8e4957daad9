"""Imports every command module so each registers its commands on the app."""

