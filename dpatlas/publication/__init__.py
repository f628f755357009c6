"""The published files and their homes: tract files, their GeoJSON, tiles, web map, STAC, feed,
withdrawal, serving."""
