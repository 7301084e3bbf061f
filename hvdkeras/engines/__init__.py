"""Engines that start the workers themselves: Ray Train (`ray`) and Spark (`spark`), imported as
`hvdkeras.ray` and `hvdkeras.spark`."""
