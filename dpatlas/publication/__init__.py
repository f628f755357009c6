"""The published files and their homes: tract files, geography, tiles, web map, STAC, feed,
withdrawal, serving."""
