"""SQL for other processes: the Spark Connect endpoint ``lakegate run`` and
``lakegate process`` serve (:mod:`.endpoint`), the client side ``lakegate
sql`` and the notebooks use (:mod:`.client`), and ``mqtt_match`` as a SQL
function every session of the endpoint sees (:mod:`.match_sql`)."""
