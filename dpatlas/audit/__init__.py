"""Check a published release from its folder alone: ``dpatlas audit RELEASE_DIR``.

An auditor needs the release folder and nothing of this project's code: this package imports
only the standard library, numpy, pyarrow (with pandas), shapely (to compare polygons),
dp-accounting (for the zCDP → (ε, δ) conversion the manifest states it used), for
``--ledger`` only, SQLAlchemy, and for the ``small_area`` check and ``--boundaries`` only
geopandas and ``dpatlas.small_area`` (which imports nothing of ours). It reads the vector
tiles with the ``pmtiles`` and ``mapbox-vector-tile`` packages. It re-derives every
privacy figure of the manifest from first principles, checks the manifest's structure
against fixed rules rather than against itself, and compares:

(s) schema: ``manifest_version`` is one this audit reads (2; 3 adds the standard errors; 4
    one estimand that every interval, SE, margin of error and model column declares);
    every required field is there
    with its type (``min_n``, ``ledger_entry``, ``assumptions``, ``public_values``,
    ``public``...); ``release_id`` is a valid id and the folder's name (and the ledger entry's);
    ``started`` and ``published`` are dates, published not before started nor in the future;
    ``code_version`` is a package version and a git commit (or none). A manifest over 16 MiB
    is refused before it is read, one nested deeper than 64 levels is refused (exit 2);
(p) public: ``public_values`` and the ``public`` section (docs/threat-model.md) have their
    fixed keys and meanings, the public columns are exactly geoid, state, county, name, cell,
    n, status, geometry (without name before issue 33), and "n per tract and cell is public"
    is an unverified assumption;
(a) files: every file listed in ``files`` exists with its sha256 and size; nothing else is
    in the folder except manifest.json; a symlink, FIFO, socket, device or folder in the
    folder is named, and no check ever opens one, nor a file larger than twice its recorded
    size plus 1 MiB (:func:`readable`), so a hostile folder can neither hang nor exhaust
    the audit;
(x) machine paths: no string of manifest.json or config.json is an absolute path or URL,
    and no other published file (text streamed; a PMTiles archive's metadata and a Parquet
    file's key-value metadata) holds a path or address of a machine
    (:data:`MACHINE_PATH_IN_TEXT`);
(b) config: config.json parses and agrees with the manifest's selection and budget figures;
(c) noise: each noise step's guarantee is recomputed from its parameters
    - grid Laplace: discrete Laplace of scale t = scale_num/scale_den on an integer query of
      L1 sensitivity grid_steps + dims is ε-DP with ε = (grid_steps + dims)/t
      (Canonne, Kamath & Steinke 2020, and Ghosh, Roughgarden & Sundararajan 2012);
    - grid Gaussian: discrete Gaussian of variance sigma2 on an integer query of L2
      sensitivity grid_steps + √dims is ρ-zCDP with ρ = (grid_steps + √dims)²/(2·sigma2)
      (Canonne, Kamath & Steinke 2020, Thm 4);
    - exponential-mechanism median: ε = rate/rate_den (McSherry & Talwar 2007, with the
      utility's sensitivity folded into the rate);
    - Student's t with smooth sensitivity: ε = (d+1)(beta + s/(2√d))
      (Bun & Steinke 2019, Thm 31);
    - PrivTree's split decisions with discrete Laplace noise of scale t on biased counts of
      grid_steps units per record, bias units per level (BinAgg's binning): under replace-one
      ε = grid_steps/t + Σ_j [ln S(m_j) − ln S(m_j + grid_steps)], m_j = bias − 1 − j·bias,
      S the discrete Laplace survival function, the tail bounded geometrically (the project's
      docs/binagg.md, Theorem 1, after Zhang, Xiao & Xie 2016, Thm 3.1);
    and each alternative of a step, composed sequentially (``repeat`` times each), must give
    the step's guarantee: never more, and less only by the samplers' rounding of their
    parameters (each rounds towards more noise by at most one unit of its last parameter).
    A noise step stated for add-remove neighbours (its sensitivity computed for adding or
    removing a record) pays a replace-one step only through group privacy of size 2, applied
    to each draw before composing: pure ε → 2ε, (ε, δ) → (2ε, (1 + e^ε)δ), ρ → 4ρ, μ → 2μ
    (Dwork & Roth 2014, Thm 2.2; Bun & Steinke 2016, Prop. 1.9; Dong, Roth & Su 2022,
    Sec. 2.3); no other pair of relations converts;
(d) totals: the per-tract-and-cell guarantee and the total per person over cells are
    recomposed from the steps (sequential composition: pure ε add, Dwork et al. 2006; ρ add,
    Bun & Steinke 2016 Lemma 2.3, with pure ε lifted to ε²/2, Prop. 1.4; (ε, δ) add) and the
    concentrated part converted with dp-accounting's RDP accountant at the manifest's
    ``conversion_delta`` (at the orders of :func:`zcdp_conversion_orders`, the pipeline's);
    the ledger entry's sums are recomputed the same way;
(r) relations: the release is charged for replace-one neighbours (``neighbouring_relation``,
    ``relations.charged_in``; a missing ``relation`` anywhere means replace-one, as in
    manifests written before relations were stated), every budget step, its guarantee and the
    per-tract-and-cell and total guarantees are stated for it, and every alternative whose
    noise is stated for another relation is listed in the step's ``relation_conversions``;
(k) sensitivities: for every noise step kind a manifest can hold (the selection rule, each
    publishable estimator, the intervals) the audit's own table (SENSITIVITIES) derives the
    query's sensitivity from the mechanism and public parameters (n, ranks clipped to [0, 1],
    k = n − 1 pairs, the grid) and the noise that can pay for it (mechanism, relation, number
    of coordinates the grid calibration must cover); the manifest's sensitivity text must state
    that derivation, never the other way round;
(u) columns: every column of the table is public (the fixed list) or paid for by its step
    (p25/p75 by the primary step, ``X_p25`` by ``suite: X``, the interval columns by the
    interval step, whose ``intervals.epsilon`` must be the step's, and their standard errors
    ``p25_se``/``p75_se``, present exactly with them, as post-processing of that step, and
    ``p25_moe90``/``p75_moe90`` only with them); nothing else may be declared public; from
    version 4, every value, interval, SE, margin of error and model column declares the one
    estimand: its ``published_columns`` entry and its ``tracts.schema.json`` description
    contain :data:`ESTIMAND_ID`;
(e) table: tracts.parquet has only accounted-for columns, values exactly where released,
    nothing spent where suppressed, suppression exactly where n < min_n, ``failed`` only with
    its mechanism's DP failure, ``reason`` one of an enumerated set, interval values only on
    released rows and around the released value, each standard error finite, in
    [0, SE_CAP] exactly where its interval is (up to version 3, when it was the interval's
    (hi − lo)/(2z) at ``intervals.level``, recomputed so, z from the standard library's
    NormalDist, and found rounded up by at most one unit of the 4th decimal), each 90% margin
    of error exactly where its SE is and equal to ceil(MOE90_Z·se·10⁴)/10⁴,
    the per-tract-and-cell figures where spent,
    and the manifest's counts;
(f) formats: tracts.csv and tracts.geojson row for row, and the tracts' values documents
    (tract-values/<cell>/<state>.json: each against its cell and state's rows, every one
    listed, the manifest's tract_values their columns and folders; tracts.pmtiles then holds
    each polygon with its GEOID alone) hold the values of tracts.parquet (a release published
    before: the features of tracts.pmtiles, or of each cell's tracts-<cell>.pmtiles, at
    its lowest zoom attribute for attribute; cell_tiles.py), and its
    polygons (one per GEOID): the GeoJSON's within GEOMETRY_TOLERANCE_DEGREES, the tiles'
    within TILE_TOLERANCE_UNITS of their lowest zoom's grid (:func:`tile_distance`).
(l) levels: a release with county or state levels (manifest ``levels``) has each level's
    budget steps ("level county: NoisyStats", "level county: interval") in the budget, so in
    the per-person total (d) recomposes, with the epsilons the level states; counties.* and
    states.* listed in ``files``; every column public or paid by the level's own steps; the
    table rules of (e) (values where released, suppression by n < min_n, reasons, intervals,
    standard errors); epsilon_spent / delta_spent where spent the charge of the level's own
    steps (not the per-person total); n per unit the sum of its tracts' n; the CSV and GeoJSON
    (and the level's vector tiles ``counties.pmtiles``/``states.pmtiles``, when listed, at
    their lowest zoom) holding the parquet's values and polygons, each unit's polygon the
    union of its tracts' in tracts.parquet; and no level file without its level.
(m) small_area: model-based tract columns (``p25_model``, ``_lo``, ``_hi``, ``_se``, ``_z``, and
    p75's) are there exactly with the manifest's ``small_area`` section and are declared
    post-processing (no budget step); the model is re-fitted from the published files alone
    (tracts.parquet with its geometry, counties.parquet, states.parquet) by
    ``dpatlas.small_area`` (the one package of ours the audit imports; it imports nothing of
    ours; it reads the tracts with geopandas), and every published model
    value must be within one rounding step of the re-fit, with the fits' σ² and β as stated;
    the z columns (the direct against the model) finite exactly where a direct is.

External anchors, run only when given (otherwise a ``skip`` line says what was not checked):
``--boundaries FILE`` (the boundary file whose sha256 the manifest states has every tract
exactly once per cell in the table: no row deleted; and every polygon of tracts.parquet,
tracts.geojson and tracts.pmtiles is its boundary tract's, within the tolerances of (f)) and
``--ledger URL`` (the ledger charged this release id exactly what its steps cost, recorded
this manifest's sha256 as published, and the dataset's spend, zCDP charges composed as rho
(:func:`lifetime_spend`), is within its cap; SQLite or PostgreSQL, read only).

A synthetic-microdata folder (``dpatlas synthesize``, manifest ``kind: synthetic
microdata``) gets the same files, mode, machine-path, relations, noise and totals checks, and
instead of (b) and (e): its rows have exactly the columns GEOID, cell, bin_lo, bin_hi, x, y
(no person ids), 11-digit GEOIDs, the manifest's cells and counts, finite values, and the CSV
holds the same rows.

``main(folder)`` prints one line per check and returns 0 (every check passed), 1 (a check
failed), 2 (the folder, its manifest or an anchor cannot be read) or 3 (every check passed
but the release is a test release, mode test or seeded noise: its mode line reads TEST; pass
``allow_test`` / ``--allow-test`` to accept it).


The package, one module per concern (each docstring says what it checks): base (the shared
names, the report), accounting (composing guarantees, totals), noise (each noise step's
guarantee, relations), sensitivities, schema (schema and public sections), columns (their
payers, estimand declarations), tables, formats (CSV, GeoJSON, tiles against the table),
geometry (polygons), tiles (PMTiles and MVT), levels, small_area (the model re-fit), files
(listing, sizes, bounded reads, config, mode), paths (machine paths), anchors (--boundaries,
--ledger), run (the ordered checks and ``main``). It imports nothing of ours but
``dpatlas.small_area`` and only relative imports within itself, so an auditor may copy the
folder alone and run it: ``python -m audit RELEASE_DIR``; ``python -m dpatlas.audit`` here.
The entry points are re-exported on first use (PEP 562)."""

_ENTRY_POINTS = ("audit_release", "load_manifest", "main")


def __getattr__(name: str):
    if name in _ENTRY_POINTS:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module 'dpatlas.audit' has no attribute {name!r}")
